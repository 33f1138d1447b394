"""The table engine: Reverb's tables in this process, with no network and no Reverb API objects above them.

- `items`: an item, its columns (slices of shared step cells) and its key.
- `table`: one table: items, selectors, rate limiter, episode counts, one lock.
- `tables`: a server's tables, and the `Endpoint` / `TableEndpoint` interface the API calls.
- `selectors`, `rate_limiters`: the policies a table is built with.
- `checkpoints`: every table written to, and read back from, a pickle-free folder.
- `columns`: how a writer's steps (nests) become numbered columns.

It reuses tfreplay's sum tree and rate-limit checks; nothing here imports the
transport or the API modules.
"""
