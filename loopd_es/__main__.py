from loopd_es.cli.main import entry

entry()
