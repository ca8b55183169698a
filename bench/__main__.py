from bench.apps.cli import main

main()
