from heddle.cli import main

main()
