from politeproxy.commands.cli import main

raise SystemExit(main())
