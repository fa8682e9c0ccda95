"""A mesh capability as a LangChain tool (pip install 'agent-reach[langchain]').

Any LangChain agent or LangGraph node can then call `text.translate` on whichever
instance the mesh picks. This example calls the tool directly (no model needed):

    python examples/chain.py &          # or any agent offering text.translate
    python examples/langchain_tool.py
"""

from agent_reach.langchain import mesh_tool

translate = mesh_tool(
    "text.translate",
    description="Translate English text to Chinese",
    tags=["zh"],
    timeout=5,
)

if __name__ == "__main__":
    print(translate.name, "-", translate.description)
    print(translate.invoke({"text": "hello"}))
