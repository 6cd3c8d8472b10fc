"""What a config field names, in one place: registry.py (every optimizer, FFN, norm, attention score_mod and eval
task by name, the shipped ones and a user's alike) and score_mods.py (the shipped attention score modifications).
"""
