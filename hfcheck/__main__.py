from hfcheck.cli import main

raise SystemExit(main())
