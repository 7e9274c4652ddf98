"""The explain layer: two renders of a conversation explained as directives.

``diff`` (per message), ``align`` (bounded token alignment), ``templates`` (the chat template's
own edits told from the client's), ``turns`` (one request's directives, SDK and server alike).
"""
