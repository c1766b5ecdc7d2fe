from opforge.cli import main

main()
