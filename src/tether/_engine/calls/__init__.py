"""The call path: one host call from the program through the journal to its tool and back.

The ledger (ledger.py) is the one writer of journal entries; nothing here is
imported by this package's ``__init__`` so each module loads on its own.
"""
