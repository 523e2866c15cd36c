from syncviz.cli import main

main()
