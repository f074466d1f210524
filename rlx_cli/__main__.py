from rlx_cli.cli import main

main()
