"""Small original chat dataset for the demo (CC0-1.0); see README.md and make_chat.py."""

from pathlib import Path

CHAT_JSONL = Path(__file__).with_name("chat.jsonl")
