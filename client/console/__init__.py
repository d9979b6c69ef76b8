"""The web console: `tidemark console` serves a browser view of the brokers (cluster, topics and their
messages, consumer groups with lag over time, message lookups, dead letters, users and ACL rules) and the
actions an operator takes there (offset reset, DLQ requeue, topic create and delete, user and rule
changes), each planned first and made on Apply, as the CLI plans unless --execute.

It is one more client of the brokers: every page is built from the Admin API, and every action is made
with the credentials of whoever signed in to the console, so the brokers' ACLs decide what a console user
may see and change, exactly as for the CLI. server.py runs it (sessions, sampler), handler.py routes HTTP,
views.py, browse.py and manage.py build the pages' data, static/ is the single-page app.
"""
