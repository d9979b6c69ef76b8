"""Transactional messages: half messages, their commits and rollbacks, and checks (broker/transactions/table.py)."""
