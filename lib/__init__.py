"""Helpers every layer may use: below the domain and the web app, importing nothing of ours.

As healthchecks keeps `hc/lib/`: what the site package (llmgw_site: settings,
URLs, WSGI, Celery) used to hold but inventory, livestate and nodes import,
so that no import runs back up into the site package.
"""
