"""The SGLang decode worker as a process: started and watched (supervisor, process) and called (client)."""
