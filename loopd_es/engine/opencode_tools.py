"""The custom tool files ``loopd-es opencode install`` writes into a project's ``.opencode/tool/``.

Each file is one OpenCode custom tool (the file name is the tool name) that forwards its arguments and its call
context (session, message, call, agent, directory) to the engine's tool channel, whose address and token it
reads from ``.opencode/loopd/engine.json`` at call time. The tool's answer is the engine's JSON reply; a
``title`` in it becomes the title OpenCode shows for the call (the reference's wording), the rest the output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tool_api import ToolApiConfig
    from .tool_spec import ToolSpec

PLUGIN_VERSION = "1.18.33"

_TEMPLATE = """// Written by `loopd-es opencode install`: forwards this tool call to the loopd-es engine. Do not edit.
import {{ tool }} from "@opencode-ai/plugin"
import {{ readFileSync }} from "node:fs"
import {{ join }} from "node:path"

export default tool({{
  description: {description},
  args: {{
{args}
  }},
  async execute(args, context) {{
{ask}    const config = JSON.parse(readFileSync(join(import.meta.dir, "..", "loopd", "engine.json"), "utf8"))
    const reply = await fetch(config.url + "/tool", {{
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
  }},
}})
"""

_ZOD = {
    "string": "tool.schema.string()",
    "number": "tool.schema.number()",
    "boolean": "tool.schema.boolean()",
    "array": "tool.schema.array(tool.schema.string())",
    "record": "tool.schema.record(tool.schema.string(), tool.schema.string())",
}

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
    """The TypeScript source of one tool."""
    lines = []
    for name, (kind, required, description) in spec.args.items():
        zod = _ZOD[kind] + ("" if required else ".optional()")
        if description:
            zod += f".describe({json.dumps(description)})"
        lines.append(f"    {name}: {zod},")
    ask = "" if spec.asks is None else _ASK.format(permission=json.dumps(spec.asks))
    return _TEMPLATE.format(
        description=json.dumps(spec.description), args="\n".join(lines), name=json.dumps(spec.name), ask=ask
    )


def install(project: Path, config: ToolApiConfig, specs: list[ToolSpec]) -> list[Path]:
    """Write every tool file and the engine address; returns the files written (the config is private: 0600)."""
    tool_dir = project / ".opencode" / "tool"
    loopd_dir = project / ".opencode" / "loopd"
    tool_dir.mkdir(parents=True, exist_ok=True)
    loopd_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        path = tool_dir / f"{spec.name}.ts"
        path.write_text(render(spec))
        written.append(path)
    engine = loopd_dir / "engine.json"
    engine.touch(mode=0o600)
    engine.chmod(0o600)
    engine.write_text(json.dumps({"url": config.url, "token": config.token}) + "\n")
    package = project / ".opencode" / "package.json"
    if not package.exists():  # OpenCode resolves @opencode-ai/plugin from here
        package.write_text(json.dumps({"dependencies": {"@opencode-ai/plugin": PLUGIN_VERSION}}) + "\n")
    written.append(engine)
    return written
