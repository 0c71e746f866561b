"""Text: a model's vocabulary (tokenizer, token strings, special ids) and each token's piece of
the text it was read from. Imports nothing of probserve."""
