"""Message-passing strategies on top of the queue: requests, futures, replace-not-replay."""
