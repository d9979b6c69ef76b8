"""Consumer groups and who owns what: group settings (groups.py, subscriptionGroup.json), the live
members and their heartbeats (members.py), queue ownership locks with owner epochs (locks.py), and the
broker-wide source of epochs and reset generations (epoch.py).

Imports only the core, the broker's errors and disk/ for its file.
"""
