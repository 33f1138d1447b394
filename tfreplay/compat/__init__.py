"""Other libraries' module paths over tfreplay's buffers, for a one-line switch.

`tfreplay.compat.tf_agents` mirrors `tf_agents`. Nothing here is imported by
`import tfreplay`; each module loads when first used.
"""
