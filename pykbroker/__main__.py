from pykbroker.cli import main

main()
