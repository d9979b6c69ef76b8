"""The web console: `tidemark console` serves a browser view of the brokers (cluster, topics, consumer
groups with lag over time, messages, dead letters) and the actions an operator takes there (offset reset
with a preview, DLQ requeue).

It is one more client of the brokers: every page is built from the Admin API, and every action is made
with the credentials of whoever signed in to the console, so the brokers' ACLs decide what a console user
may see and change, exactly as for the CLI.
"""
