"""What the client checks share (check_clients.py, check_lora.py, check_tools.py; run by
tests/clients/run.sh against a `mica serve` it started): the command line `URL MODEL KEY`,
`check`, which counts passes and exits non-zero on the first failure, `done`, which prints
the closing 'N passed, 0 failed', and the `openai` and `ollama` clients sending the API key."""

import sys

passed = 0


def args():
    """The server's URL, the model's name and the API key from the command line."""
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} URL MODEL KEY")
    return sys.argv[1], sys.argv[2], sys.argv[3]


def check(name, cond, detail=""):
    """Counts a passed check; prints the failure and exits 1 on a failed one."""
    global passed
    if not cond:
        print(f"FAIL {name}: {detail}")
        print(f"{passed} passed, 1 failed")
        sys.exit(1)
    passed += 1
    print(f"ok   {name}")


def done():
    print(f"{passed} passed, 0 failed")


def openai_client(url, key):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=key)


def ollama_client(url, key):
    import ollama

    return ollama.Client(host=url, headers={"Authorization": f"Bearer {key}"})
