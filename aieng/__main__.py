from aieng.cli.main import main

raise SystemExit(main())
