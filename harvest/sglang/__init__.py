"""Every touch point between harvest and SGLang: the one package to revisit when SGLang changes."""
