"""Tidemark source and sink for the PySpark Python Data Source API."""
