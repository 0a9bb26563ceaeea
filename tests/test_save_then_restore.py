"""A restore sent while the save of that name is still being written reads what the save writes
(the save, then the restore, from another connection, without waiting for the save's answer)."""

from __future__ import annotations

from igi_sdk.client import Client
from tests.test_bridge import model_dir, sidecar  # noqa: F401 - fixtures

GREEDY = {"temperature": 0.0}


def test_a_restore_waits_for_the_save_in_flight_of_its_name(sidecar) -> None:  # noqa: F811
    endpoint, _ = sidecar
    a, b = Client(endpoint, timeout=60), Client(endpoint, timeout=60)
    try:
        sid = a.open_session("You are a smith.", sampling=GREEDY)
        a.chat(sid, "I am the smith's apprentice.", max_tokens=4).result()
        for n in range(3):  # the race is lost most times without the wait
            name = f"in-flight-{n}"
            save = a.send("save_session", {"session": sid, "name": name})
            # ZeroMQ keeps each connection's order, not the order across connections: a ping
            # answered on a's connection means the save was read before b's restore is sent
            # (the socket thread answers the ping at once; the engine writes the save after)
            a.request("ping")
            restored = b.restore_session(name)  # sent before the save is answered
            assert restored
            b.close_session(restored)
            kind, body = a.next_event(save, timeout=60)
            assert kind == "ok" and body["bytes"] > 0
    finally:
        a.close()
        b.close()
