"""A retry policy for flaky tools: on a node error of a kind listed in `retryOn`, wait and run
the node again, doubling the wait each time. heddle caps the attempts (--max-node-attempts)."""

from heddle.plugin import Plugin, retry

plugin = Plugin()


@plugin.after("RetryPolicy", "nodeError")
def on_error(call):
    settings = call.config
    if call.params["errorKind"] not in settings["retryOn"]:
        return None  # not ours to retry: the error stands
    attempt = call.params["attempt"]
    if attempt >= call.params["maxAttempts"]:
        call.log(f"node {call.node['name']!r} failed {attempt} times; giving up", level="warning")
        return None
    delay = settings["delay"] * settings["backoff"] ** (attempt - 1)
    return retry(delay, reason=f"attempt {attempt} failed with a passing error")


if __name__ == "__main__":
    plugin.serve()
