"""BlockingConsumer: what the two blocking consumers, PushConsumer and PullConsumer, share on top of
BlockingClient.

Kept apart so that a consumer's identity is described once: both join a group the same way (membership,
allocation, queue locks all go by the client id), so an application asks either of them the same
question and gets the same kind of answer.
"""

from __future__ import annotations

from tidemark.client.runtime import BlockingClient
from tidemark.client.settings import ConsumerSettings


class BlockingConsumer(BlockingClient):
    """A blocking consumer: a subclass sets `settings` (and BlockingClient's `_loop` and `_life`)."""

    settings: ConsumerSettings

    @property
    def client_id(self) -> str:
        """How the brokers know this consumer in its group (member lists, allocation, queue locks):
        RocketMQ's clientId, client_ip@instance_name. Without an instance_name each consumer of the
        process gets its own (pid, pid-2...), so two consumers in one process never share one."""
        return self.settings.client_id
