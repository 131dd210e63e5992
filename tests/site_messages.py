"""One message to one Flower site, in process (not collected: no test_ prefix): what the ServerApp sends a
SuperNode, handed to the site's handler (:mod:`fedstyle.runtimes.flower.site`) with a node config of the test's
choosing. Shared by the site privacy tests (test_site_noise_guard.py, test_site_releases.py)."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from flower_grid import server_task_identity


def node(**config) -> Context:
    """A SuperNode's context with ``config`` as its node config (``partition_id`` for ``partition-id`` etc.)."""
    return Context(run_id=1, node_id=7, node_config={k.replace("_", "-"): v for k, v in config.items()},
                   state=RecordDict(), run_config={})


def send(handler: str, config_json: str, context: Context, *, round_index: int = 0, weights=None,
         session: str = "s1", session_start: int = 0, durable_round: int = 0, num_clients: int = 3):
    """The reply's payload (``{name: tensor}``) of the site's ``handler`` ("round_query", "setup_upload") to the
    message the ServerApp sends for ``round_index`` (weights: none, the run's initial ones, unless given)."""
    from fedstyle.runtimes.flower import site
    from fedstyle.runtimes.flower.records import PAYLOAD, build_content, meta_record
    from fedstyle.runtimes.flower.received import received_payload

    meta = meta_record(config=config_json, client_id=int(context.node_config["partition-id"]), round=round_index,
                       num_clients=num_clients, session=session, session_start=session_start,
                       durable_round=durable_round)
    with server_task_identity():
        message = Message(build_content(meta, weights=weights, payloads={PAYLOAD: {}}), dst_node_id=context.node_id,
                          message_type=f"query.{handler}", group_id=str(round_index), ttl=600)
        message.metadata.__dict__["_message_id"] = message.object_id
        reply = getattr(site, handler)(message, context)
    return received_payload(reply.content, "cpu", PAYLOAD)
