class HarvestError(Exception):
    """Bad user input (config, trace, profile, flag, request): the message names the problem.

    The CLI prints it as one line and exits non-zero; library code raises it instead of printing.
    """
