from loopd_es.cli.entry import entry

entry()
