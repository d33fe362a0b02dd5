"""Open WebUI's browser flow for a new saved chat, without a browser: the request its UI sends when the user
starts a chat (parent_id null, a user_message, a session_id, background_tasks), after which Open WebUI creates
the chat, runs it in the background and then, as background tasks, asks the model for follow-ups, a title and
tags, saving each into the chat. Used by open_webui_drive.py."""
import time
import uuid

import httpx

QUESTION = "What is the capital of France?"


def start_chat(client: httpx.Client, model: str) -> str:
    user_id = str(uuid.uuid4())
    body = {"model": model, "stream": True, "parent_id": None, "id": str(uuid.uuid4()),
            "session_id": "no-socket-" + uuid.uuid4().hex,  # events to it go nowhere; the chat is saved all the same
            "messages": [{"role": "user", "content": QUESTION}],
            "user_message": {"id": user_id, "role": "user", "content": QUESTION, "parentId": None,
                             "childrenIds": [], "models": [model], "timestamp": int(time.time())},
            "background_tasks": {"title_generation": True, "tags_generation": True, "follow_up_generation": True}}
    reply = client.post("/api/chat/completions", json=body)
    reply.raise_for_status()
    return reply.json()["chat_id"]


def wait_until_idle(client: httpx.Client, chat_id: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    time.sleep(1)
    while time.monotonic() < deadline:
        if not client.get(f"/api/tasks/chat/{chat_id}").json().get("task_ids"):
            return True
        time.sleep(2)
    return False


def saved_chat(client: httpx.Client, model: str, timeout_s: float = 300) -> dict:
    """What the UI would show once the chat and its background tasks are done."""
    chat_id = start_chat(client, model)
    idle = wait_until_idle(client, chat_id, timeout_s)
    chat = client.get(f"/api/v1/chats/{chat_id}").json()
    messages = chat["chat"]["history"]["messages"].values()
    answer = next((m for m in messages if m.get("role") == "assistant"), {})
    return {"finished": idle, "title": chat.get("title"), "answer": answer.get("content", ""),
            "done": answer.get("done"), "follow_ups": answer.get("followUps"),
            "tags": (chat.get("meta") or {}).get("tags")}
