"""Other toolkits and engines: a Hugging Face MarianMT model imported, and an aiayn model
exported to CTranslate2 or ONNX Runtime, with translators that run the exports behind
`Translator`'s methods.
"""
