"""Batch work: OpenAI's Files and Batch APIs (files and batch records in storage, the lines of a
batch, and the runner that sends each line through the ingress's own admission), and dataset
scoring on Ray Data (serve_app.batch.dataset, serve_app.batch.scoring)."""
