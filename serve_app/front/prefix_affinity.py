"""Which replica of a model most likely holds a prompt's leading KV blocks: an index, in each
router, of the leading blocks it sent to each replica, and the choice it makes from it.

A replica's prefix caches (vLLM's KV blocks, the scored-prefix cache) serve only the requests
that reach it: the choices of a multiple-choice question computed their context once on one
replica, once per replica they landed on with several. Each request's leading blocks are named
by chained hashes (a block's key covers every token before it, and the cache namespace: a
tenant's, an adapter's), as vLLM names its cached blocks. The router sends a request to the
replica it sent the longest run of those keys to, among those with room, unless that
replica would then hold more than `load_factor` times the mean of the requests in flight and
`load_slack` more (the bound of consistent hashing with bounded loads, Mirrokni et al. 2018,
with a slack so that a question's few choices stay together on an idle service); without a
match, to the less loaded of Serve's two random choices, and that replica then holds the
prefix.

Nothing is asked of the replicas per request: the index holds what this router sent, which
an engine may have evicted since (the request is then computed whole, as without routing),
and each replica's entries are a bounded LRU. A replica that leaves takes its entries with it;
one that joins gets new prefixes by load: no other replica's prefixes move.
"""

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from serve_app.engine.shared_prefix import block_keys

# Blocks of a prompt the index keys: a match deeper than this many is a match of this many.
MAX_KEYED_BLOCKS = 256


def prefix_keys(token_ids: Sequence[int], block_tokens: int, namespace: str) -> list[int]:
    """The keys of the prompt's whole leading blocks, up to MAX_KEYED_BLOCKS, as the replica
    keys the prefixes it computes (Python's own hash, seeded by the process: an index lives in
    the router that made its keys; a collision costs a route, never an answer)."""
    return block_keys(token_ids, block_tokens, min(len(token_ids), block_tokens * MAX_KEYED_BLOCKS),
                      namespace)


class ReplicaPrefixes:
    """The keys last sent to one replica, the least recently sent dropped past `capacity`."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.keys: OrderedDict[int, None] = OrderedDict()

    def add(self, keys: Iterable[int]) -> None:
        for key in keys:
            self.keys[key] = None
            self.keys.move_to_end(key)
        while len(self.keys) > self.capacity:
            self.keys.popitem(last=False)

    def matched_blocks(self, keys: Sequence[int]) -> int:
        """How many of the keys' leading blocks were sent here: its deepest key present (a
        key names its whole prefix)."""
        for depth in range(len(keys), 0, -1):
            if keys[depth - 1] in self.keys:
                return depth
        return 0


class PrefixIndex:
    """Each replica's prefixes, as one router sent them."""

    def __init__(self, capacity_per_replica: int, load_factor: float, load_slack: int):
        self.capacity, self.load_factor, self.load_slack = capacity_per_replica, load_factor, load_slack
        self.replicas: dict[Hashable, ReplicaPrefixes] = {}

    def sent(self, replica: Hashable, keys: Sequence[int]) -> None:
        if keys:
            self.replicas.setdefault(replica, ReplicaPrefixes(self.capacity)).add(keys)

    def keep_only(self, replicas: Iterable[Hashable]) -> None:
        """Forgets the replicas no longer running."""
        running = set(replicas)
        for gone in self.replicas.keys() - running:
            del self.replicas[gone]

    def within_bound(self, load: int, loads: dict[Hashable, int]) -> bool:
        """Whether a replica with `load` requests in flight may take one more by affinity:
        then at most `load_factor` times the mean and `load_slack` more."""
        mean_after = (sum(loads.values()) + 1) / len(loads)
        return load + 1 <= self.load_factor * mean_after + self.load_slack

    def choose(self, keys: Sequence[int], loads: dict[Hashable, int]) -> Hashable | None:
        """Of the replicas in `loads` (each with room, its requests in flight), the one with
        the longest match of `keys` within the load bound, the less loaded of equals; None
        where none matches."""
        best, best_rank = None, (0, 0)
        for replica, load in loads.items():
            prefixes = self.replicas.get(replica)
            depth = prefixes.matched_blocks(keys) if prefixes else 0
            if depth and self.within_bound(load, loads) and (depth, -load) > best_rank:
                best, best_rank = replica, (depth, -load)
        return best
