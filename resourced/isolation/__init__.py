"""Device isolation: a claim's processes run in a systemd scope whose device filter lets
them open the claim's GPUs and no others.

``devices`` says which nodes a claim's scope allows; ``helper`` is the small root service
that asks systemd for scopes (the daemon's account may not: systemd 252 gives polkit no
unit name for ``StartTransientUnit``, so no rule can limit a grant to our scopes);
``scopes`` is the daemon's side: it calls the helper and finds its scopes again.
"""
