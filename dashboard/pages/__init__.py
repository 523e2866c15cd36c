"""Dashboard pages. Each module registers itself with dash.register_page when imported (create_app
imports them after the Dash app exists) and defines its thin callbacks next to its layout."""
