"""The syncviz Dash app (``syncviz dash ROOT``): replay recorded runs bucket by bucket, step by step.

store.py loads runs (cached by file size/mtime), timeline.py and charts.py turn analysis tables
into figures, pages/ holds the pages (they register themselves), app.py the app and the command.
"""
