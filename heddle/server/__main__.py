from heddle.server.cli import main

main()
