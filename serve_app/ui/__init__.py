"""The token-probability viewer's page: static files that serve_app.front.viewer serves at /ui."""
