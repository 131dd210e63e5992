"""Test-only algorithms shared by several test files (not collected: no test_ prefix)."""

from __future__ import annotations

import torch

from fedstyle.algorithms.fedavg import FedAvg


class ExchangeProbe(FedAvg):
    """Uses every exchange hook and records what arrives, so the test can check the plumbing."""

    name = "exchange_probe"

    def setup_upload(self, ctx, model):
        return {"label_mean": ctx.data.labels.float().mean().reshape(1), "cid": ctx.client_id}

    def setup_broadcast(self, uploads, server):
        server.state["bank_size"] = torch.tensor(len(uploads))
        return {"bank": torch.cat([uploads[c]["label_mean"] for c in sorted(uploads)])}

    def setup_download(self, ctx, model, broadcast):
        ctx.state["bank"] = broadcast["bank"].clone()
        return {"bank_entries": float(len(broadcast["bank"]))}

    def round_query(self, ctx, model):
        return {"size": torch.tensor([float(len(ctx.data))])}

    def round_payloads(self, server, client_ids, queries):
        # each sampled client receives the next sampled client's answer (a one-to-one share)
        return {c: {"peer_size": queries[client_ids[(i + 1) % len(client_ids)]]["size"]}
                for i, c in enumerate(client_ids)}

    def training_loss(self, ctx, model, x, y, payload):
        ctx.state["received"] = payload["peer_size"].clone()
        return super().training_loss(ctx, model, x, y, payload)

    def upload_payload(self, ctx, model):
        return {"seen": torch.ones(3)}
