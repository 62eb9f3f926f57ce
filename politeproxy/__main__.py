from politeproxy.cli import main

raise SystemExit(main())
