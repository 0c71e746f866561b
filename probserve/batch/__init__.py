"""OpenAI's Files and Batch APIs: files and batch records in storage, the lines of a batch, and
the runner that sends each line through the ingress's own admission."""
