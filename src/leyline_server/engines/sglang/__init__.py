"""The SGLang engine: Leyline's splice on SGLang's own radix cache, allocator and KV pool (GPU).

What runs where::

    main process                                         scheduler process (every TP rank)
    ------------                                         ---------------------------------
    LeylineService (FastAPI, sessions)                   SGLang Scheduler (event loop, batches)
      AsyncSGLangEngine (Engine protocol)                  + plugin handler for LeylineCtlReq
        splice executor (splice/execute.py)                  SchedulerSplicer: pin/unpin, probe,
          SGLangSpliceBackend (SpliceBackend) --control-->   counts, canary, extend (alloc + rotate
                                              <--reply---    + insert) on tree_cache / allocator /
        SGLangClient: SGLang's tokenizer manager             KV pool, between batches
          on its own event loop thread --GenerateReqInput-->  prefill/decode by SGLang's batches

A splice is the same :func:`~leyline_server.splice.plan.plan_splice` walked by the same executor as
on the embedded engine. ``begin``/``move``/``fill`` only record the plan's steps; ``commit`` runs
them in new-position order, because SGLang's tree is a trie whose paths must exist left to right:
each replacement (and the tail) is a normal SGLang request of the new sequence up to its end
(``max_new_tokens=1``: the prefix hits the cache, SGLang's batched prefill computes the rest and
inserts it when the request finishes); each run of moved tokens is one control request whose
handler, in one scheduler iteration, matches the new prefix, allocates slots, copy-rotates the
old rows into them (:func:`~leyline_server.kernels.rotate_copy_layers`) and inserts the extended
path. No slot is ever held outside the tree between iterations (SGLang's idle leak check).

Privacy: SGLang partitions its tree by ``cache_salt`` from the root down, so a session's requests
carry the namespace of its :class:`~leyline_server.contract.base.CacheScope` (salt + session tag)
from the first one on. Its rotated KV is matched only by the session; the price is that sessions
do not share prefixes with each other (requests without a session share per salt).

Nothing here may be imported outside this package except by the engine factory and the CLI.
"""
