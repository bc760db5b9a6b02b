"""The web console (``/console/``) and approval links (``/approve/<token>``) of ``tether serve --http``.

Server-rendered pages (Starlette + Jinja2): they work without JavaScript; one
static script swaps in fresh content when the server-sent event feed says a
run changed. Security, in the order a request meets it:

* a request whose ``Host`` is not a name of this server (loopback names on a
  loopback bind, ``public_url``'s host) is refused with 421 before anything
  else, ``--dev`` included: a DNS-rebinding page cannot reach the console;
* form bodies are read only when they say they are a form and only up to
  ``MAX_FORM_BYTES``: an unauthenticated POST cannot make the server buffer
  more than that;
* responses carry a CSP without inline scripts, ``frame-ancestors 'none'``,
  ``Referrer-Policy: no-referrer`` (an approval link is a capability and must
  not leak through a Referer) and ``Cache-Control: no-store``;
* the console needs a session: signing in with one of the server's bearer
  tokens sets an HttpOnly, SameSite=Strict cookie (Secure over TLS) naming the
  token's principal, signed with a key derived from the store's secret;
  signing out records the session as ended in the store, so the cookie opens
  nothing afterwards, in any process sharing the store;
* every form carries a CSRF token bound to the session (or, before there is
  one, to a SameSite=Strict cookie set with the form);
* a principal sees the runs it may act on and decides only the writes its
  rights allow: ``tether._engine.approvals`` answers both, as for every surface. The
  principal that ran a program does not approve its writes unless
  ``self_approval`` says so;
* an approval link shows its write to whoever holds it; deciding on it needs
  a signed-in approver unless ``[server] links = "capability"``;
* every decision is recorded with who made it (the token's name) and through what.

The package, by what its parts are: ``app.py`` builds the ``Console`` (its route table);
``asgi.py`` the host check, security headers and the router beside MCP; ``base.py`` what every
handler shares (rights, names, drawing a page); ``sessions.py`` session cookies, CSRF tokens and
reading forms; ``login.py`` signing in and out; ``pages.py`` the run list and a run's page;
``decisions.py`` the decision form; ``links.py`` approval links; ``feed.py`` the live event feed;
``render.py`` the templates' environment and filters.
"""

from tether._server.console.app import Console
from tether._server.console.asgi import Router
from tether._server.console.links import CAPABILITY_HOLDER
from tether._server.console.sessions import MAX_FORM_BYTES

__all__ = ["CAPABILITY_HOLDER", "MAX_FORM_BYTES", "Console", "Router"]
