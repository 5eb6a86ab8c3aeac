"""The ``vflsec`` commands, one module per command group, thin as the servicers are: each parses and checks its
options, calls the room that does the work (federation/, experiments/, bench/, the services) and prints what it
returns. client/cli.py assembles them into the command line."""
