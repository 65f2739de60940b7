"""The custom tool files ``loopd-es opencode install`` writes into a project's ``.opencode/tool/``.

Each file is one OpenCode custom tool (the file name is the tool name) that forwards its arguments and its call
context (session, message, call, agent, directory) to the engine's tool channel, whose Unix socket and token it
reads from ``.opencode/loopd/engine.json`` at call time (Bun's ``fetch`` takes a ``unix`` option). It sends
nothing unless the socket's directory is a directory only this user can enter. The tool's answer is the
engine's JSON reply, or a JSON refusal when the engine is not serving; a ``title`` in the reply becomes the title
OpenCode shows for the call (the reference's wording), the rest the output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .tool_api import CONFIG_NAME

if TYPE_CHECKING:
    from .tool_api import ToolApiConfig
    from .tool_spec import ToolSpec

PLUGIN_VERSION = "1.18.33"

_TEMPLATE = """// Written by `loopd-es opencode install`: forwards this tool call to the loopd-es engine. Do not edit.
import {{ tool }} from "@opencode-ai/plugin"
import {{ lstatSync, readFileSync }} from "node:fs"
import {{ dirname, join }} from "node:path"

export default tool({{
  description: {description},
  args: {{
{args}
  }},
  async execute(args, context) {{
{ask}    const config = JSON.parse(readFileSync(join(import.meta.dir, "..", "loopd", "engine.json"), "utf8"))
    const where = dirname(config.socket)
    let dir
    try {{ dir = lstatSync(where) }} catch {{ dir = undefined }}
    if (dir && (!dir.isDirectory() || dir.uid !== process.getuid() || (dir.mode & 0o077) !== 0))
      return JSON.stringify({{ ok: false, message: `refusing to call the loopd-es engine: ${{where}} is not a directory only you can enter` }})
    try {{
      const reply = await fetch("http://loopd-es/tool", {{
        unix: config.socket,
        method: "POST",
        headers: {{ "content-type": "application/json", authorization: "Bearer " + config.token }},
        body: JSON.stringify({{
          tool: {name},
          args,
          context: {{ sessionID: context.sessionID, messageID: context.messageID, callID: context.callID,
                     agent: context.agent, directory: context.directory }},
        }}),
      }})
      const text = await reply.text()
      try {{
        const {{ title, ...answer }} = JSON.parse(text)
        if (typeof title === "string") return {{ title, output: JSON.stringify(answer) }}
      }} catch {{}}
      return text
    }} catch (e) {{
      return JSON.stringify({{ ok: false, message: `the loopd-es engine is not serving tools (start \\`loopd-es run\\` in this project): ${{e}}` }})
    }}
  }},
}})
"""

# The reference asks OpenCode for ``bash`` permission before a command starts: the argv as the pattern, the
# program as what "always" allows. A refusal throws inside OpenCode, so nothing reaches the engine.
_ASK = """    await context.ask({{
      permission: {permission},
      patterns: [[args.command, ...(args.args ?? [])].join(" ")],
      always: [args.command],
      metadata: {{}},
    }})
"""


def render(spec: ToolSpec) -> str:
    """The TypeScript source of one tool: its zod arguments are the tool's Struct's JSON schema, in zod."""
    required = set(spec.required())
    lines = []
    for name, schema in spec.properties().items():
        zod = zod_of(schema) + ("" if name in required else ".optional()")
        if schema.get("description"):
            zod += f".describe({json.dumps(schema['description'])})"
        lines.append(f"    {name}: {zod},")
    ask = "" if spec.asks is None else _ASK.format(permission=json.dumps(spec.asks))
    return _TEMPLATE.format(
        description=json.dumps(spec.description), args="\n".join(lines), name=json.dumps(spec.name), ask=ask
    )


_BOUNDS: Final = (  # JSON schema keyword -> zod method, for numbers, strings and arrays alike
    ("minimum", "min"),
    ("maximum", "max"),
    ("exclusiveMinimum", "gt"),
    ("exclusiveMaximum", "lt"),
    ("minLength", "min"),
    ("maxLength", "max"),
    ("minItems", "min"),
    ("maxItems", "max"),
)


def zod_of(schema: dict[str, Any]) -> str:
    """The zod expression (over OpenCode's ``tool.schema``) for one argument's JSON schema.

    :raises ValueError: for a schema shape no tool argument uses (a new one must be added here, not guessed).
    """
    kind = schema.get("type")
    if "enum" in schema:
        out = f"tool.schema.enum({json.dumps(schema['enum'])})"
    elif kind == "string":
        out = "tool.schema.string()"
    elif kind == "integer":
        out = "tool.schema.number().int()"
    elif kind == "number":
        out = "tool.schema.number()"
    elif kind == "boolean":
        out = "tool.schema.boolean()"
    elif kind == "array":
        out = f"tool.schema.array({zod_of(schema['items'])})"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        out = f"tool.schema.record(tool.schema.string(), {zod_of(schema['additionalProperties'])})"
    else:
        raise ValueError(f"no zod form for the JSON schema {schema!r}")
    for keyword, method in _BOUNDS:
        if keyword in schema:
            out += f".{method}({json.dumps(schema[keyword])})"
    return out


def install(project: Path, config: ToolApiConfig, specs: list[ToolSpec]) -> list[Path]:
    """Write every tool file and the channel's config; returns the files written, the config last.

    The config holds the token, so it is 0600 and listed in ``.opencode/loopd/.gitignore``: a
    ``git add .opencode`` (the tools are worth committing) leaves it out.
    """
    tool_dir = project / ".opencode" / "tool"
    loopd_dir = project / ".opencode" / "loopd"
    tool_dir.mkdir(parents=True, exist_ok=True)
    loopd_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        path = tool_dir / f"{spec.name}.ts"
        path.write_text(render(spec))
        written.append(path)
    _ignore(loopd_dir / ".gitignore", CONFIG_NAME)
    engine = loopd_dir / CONFIG_NAME
    tmp = loopd_dir / f".{CONFIG_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(fd, 0o600)  # an old temp file keeps its mode through O_CREAT
        out.write(json.dumps({"socket": config.socket, "token": config.token}) + "\n")
    os.replace(tmp, engine)
    package = project / ".opencode" / "package.json"
    if not package.exists():  # OpenCode resolves @opencode-ai/plugin from here
        package.write_text(json.dumps({"dependencies": {"@opencode-ai/plugin": PLUGIN_VERSION}}) + "\n")
    written.append(engine)
    return written


def _ignore(gitignore: Path, name: str) -> None:
    """Add ``name`` to ``gitignore`` unless a line already names it."""
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    if name in (line.strip() for line in lines):
        return
    note = [] if lines else ["# written by `loopd-es opencode install`: the engine's token stays out of git"]
    gitignore.write_text("\n".join([*lines, *note, name]) + "\n")
