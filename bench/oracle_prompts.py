"""The oracle prompts: the user messages whose greedy answers the tests compare with
transformers' (tests/engine/test_engine_oracle.py and the tests beside it) and the KV error
benchmark reads (bench.kv_quant_error). Mixed lengths, languages and tasks."""

from __future__ import annotations

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
    "Give me a short recipe for pancakes.",
    "Who wrote Pride and Prejudice?",
    "Write a Python function that reverses a string.",
    "Why is the sky blue? Answer briefly.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What are the three states of matter?",
    "Suggest a name for a friendly robot.",
    "How many continents are there? Name them.",
    "Describe the taste of a lemon to someone who never had one.",
    "What does HTTP stand for?",
    "Écris une phrase en français sur le printemps.",
    "What is the boiling point of water at sea level in Celsius and Fahrenheit?",
    "Tell me a fun fact about octopuses. " * 6,
    "Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, "
    "kiwi, lemon, mango, nectarine, orange, papaya. Which of them are citrus fruits?",
]
