"""The broker's files besides the message store: the data dir's lock and format stamp, the small JSON
metadata files (topics.json, subscriptionGroup.json) written off the event loop, and the segmented record
logs under the offset, pop and producer journals.

Imports only the core (tidemark.common), the broker's errors and the store's file helpers.
"""
