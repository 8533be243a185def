"""The official MCP Python SDK's client (PyPI `mcp`) against `storekeeper mcp --http`.

Usage: mcp_python_client.py URL READ_KEY SUPPORT_KEY ACCOUNT OUT_JSON

Opens two sessions at once, one per key, lists each session's tools, then calls at the same time
(the SDK numbers both sessions' requests from the same ids): the read key tries to credit coins,
the support key adds a note. Writes what each saw to OUT_JSON; exits 0 once it has written it.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def field(value, snake, camel):
    """The SDK's 1.x names are camelCase, 2.x's snake_case."""
    return getattr(value, snake) if hasattr(value, snake) else getattr(value, camel)


def text_of(result):
    return "".join(getattr(part, "text", "") for part in result.content)


async def main(url, read_key, support_key, account, out):
    report = {}
    reader_http = create_mcp_http_client(headers={"Authorization": f"Bearer {read_key}"})
    support_http = create_mcp_http_client(headers={"Authorization": f"Bearer {support_key}"})
    async with reader_http, support_http:
        async with streamable_http_client(url, http_client=reader_http) as reader_streams:
            async with streamable_http_client(url, http_client=support_http) as support_streams:
                async with ClientSession(reader_streams[0], reader_streams[1]) as reader:
                    async with ClientSession(support_streams[0], support_streams[1]) as support:
                        hello = await reader.initialize()
                        await support.initialize()
                        report["serverName"] = field(hello, "server_info", "serverInfo").name
                        report["readerTools"] = sorted(t.name for t in (await reader.list_tools()).tools)
                        report["supportTools"] = sorted(t.name for t in (await support.list_tools()).tools)
                        credit, note = await asyncio.gather(
                            reader.call_tool(
                                "credit_balance",
                                {
                                    "accountId": account,
                                    "currency": "coins",
                                    "amount": 500,
                                    "reason": "python sdk",
                                    "idempotencyKey": "python-sdk-1",
                                },
                            ),
                            support.call_tool("add_account_note", {"accountId": account, "text": "from python"}),
                        )
                        report["readerCredit"] = {"isError": bool(field(credit, "is_error", "isError")), "text": text_of(credit)}
                        report["supportNote"] = {"isError": bool(field(note, "is_error", "isError")), "text": text_of(note)}
                        account_view = await reader.call_tool("get_account", {"accountId": account})
                        report["readerAccount"] = {
                            "isError": bool(field(account_view, "is_error", "isError")),
                            "text": text_of(account_view),
                        }
    with open(out, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
