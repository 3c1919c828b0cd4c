"""Everything this app takes from the web app `nodes`, imported in this one place.

`nodes` is being reorganised (its Redis helpers are moving into their own
package); when a name moves, this file is the only one to change.
"""

from nodes.models import digest, digest_matches, new_secret, split_token
from nodes.ratelimit import TOO_MANY_REFUSED, Limiter, client_address, count_failure, warn_unlimited
from nodes.views.access import login_required
from nodes.views.cluster import DB_SORTS, LOAD_SORTS, MAX_TEXT, TableQuery
from nodes.views.loads import Reading, fetch_readings, fresh_figures, heartbeat_age

__all__ = [
    "DB_SORTS",
    "LOAD_SORTS",
    "MAX_TEXT",
    "TOO_MANY_REFUSED",
    "Limiter",
    "Reading",
    "TableQuery",
    "client_address",
    "count_failure",
    "digest",
    "digest_matches",
    "fetch_readings",
    "fresh_figures",
    "heartbeat_age",
    "login_required",
    "new_secret",
    "split_token",
    "warn_unlimited",
]
