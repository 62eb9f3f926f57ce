"""The command line: the CLI, doctor, env lines."""
