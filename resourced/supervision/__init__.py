"""A command's processes while it runs on a claim: how ``gpuctl run`` starts it (``launch``)
and how a command is stopped (``stopping``: the one policy, shared with the runner)."""
