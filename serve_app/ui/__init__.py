"""The token-probability viewer's page: static files that probserve.front.viewer serves at /ui."""
