"""The papers the chapters cite: the book's references page (``references.html``) and the
links on the quoted titles in the chapters come from this list (book/build.py).

A chapter cites a paper as ``Surname et al., "Title" (year)``; the quoted title (or its first
words: "BERT", "YaRN") is matched against ``title``. tests/test_book.py checks that every such
citation in a chapter, and every arXiv id or DOI a chapter mentions, is in this list: a new
citation needs its entry here. Links: ``arxiv`` (https://arxiv.org/abs/ID), else ``doi``
(https://doi.org/DOI), else ``url``.
"""

from __future__ import annotations

PAPERS: list[dict[str, str]] = [
    {"key": "vaswani2017", "authors": "A. Vaswani et al.", "year": "2017",
     "title": "Attention Is All You Need", "venue": "NeurIPS 2017", "arxiv": "1706.03762"},
    {"key": "su2021", "authors": "J. Su et al.", "year": "2021",
     "title": "RoFormer: Enhanced Transformer with Rotary Position Embedding", "arxiv": "2104.09864"},
    {"key": "press2022", "authors": "O. Press, N. A. Smith and M. Lewis", "year": "2022",
     "title": "Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation",
     "venue": "ICLR 2022", "arxiv": "2108.12409"},
    {"key": "raffel2020", "authors": "C. Raffel et al.", "year": "2020",
     "title": "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
     "venue": "JMLR 21", "arxiv": "1910.10683"},
    {"key": "chen2023", "authors": "S. Chen et al.", "year": "2023",
     "title": "Extending Context Window of Large Language Models via Positional Interpolation",
     "arxiv": "2306.15595"},
    {"key": "peng2023", "authors": "B. Peng et al.", "year": "2023",
     "title": "YaRN: Efficient Context Window Extension of Large Language Models", "arxiv": "2309.00071"},
    {"key": "kazemnejad2023", "authors": "A. Kazemnejad et al.", "year": "2023",
     "title": "The Impact of Positional Encoding on Length Generalization in Transformers",
     "venue": "NeurIPS 2023", "arxiv": "2305.19466"},
    {"key": "xiong2020", "authors": "R. Xiong et al.", "year": "2020",
     "title": "On Layer Normalization in the Transformer Architecture", "venue": "ICML 2020",
     "arxiv": "2002.04745"},
    {"key": "devlin2019", "authors": "J. Devlin et al.", "year": "2019",
     "title": "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding",
     "venue": "NAACL 2019", "arxiv": "1810.04805", "doi": "10.18653/v1/N19-1423"},
    {"key": "michel2019", "authors": "P. Michel, O. Levy and G. Neubig", "year": "2019",
     "title": "Are Sixteen Heads Really Better than One?", "venue": "NeurIPS 2019", "arxiv": "1905.10650"},
    {"key": "voita2019", "authors": "E. Voita et al.", "year": "2019",
     "title": "Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned",
     "venue": "ACL 2019", "arxiv": "1905.09418", "doi": "10.18653/v1/P19-1580"},
    {"key": "elhage2021", "authors": "N. Elhage et al.", "year": "2021",
     "title": "A Mathematical Framework for Transformer Circuits", "venue": "Transformer Circuits Thread",
     "url": "https://transformer-circuits.pub/2021/framework/index.html"},
    {"key": "zhang2024", "authors": "F. Zhang and N. Nanda", "year": "2024",
     "title": "Towards Best Practices of Activation Patching in Language Models: Metrics and Methods",
     "venue": "ICLR 2024", "arxiv": "2309.16042"},
    {"key": "bhojanapalli2020", "authors": "S. Bhojanapalli et al.", "year": "2020",
     "title": "Low-Rank Bottleneck in Multi-head Attention Models", "venue": "ICML 2020", "arxiv": "2002.07028"},
    {"key": "olsson2022", "authors": "C. Olsson et al.", "year": "2022",
     "title": "In-context Learning and Induction Heads", "venue": "Transformer Circuits Thread",
     "arxiv": "2209.11895"},
    {"key": "wang2022", "authors": "K. Wang et al.", "year": "2022",
     "title": "Interpretability in the Wild: a Circuit for Indirect Object Identification in GPT-2 small",
     "venue": "ICLR 2023", "arxiv": "2211.00593"},
    {"key": "singh2024", "authors": "A. K. Singh et al.", "year": "2024",
     "title": "What needs to go right for an induction head? A mechanistic study of in-context learning circuits "
              "and their formation", "venue": "ICML 2024", "arxiv": "2404.07129"},
    {"key": "sennrich2016", "authors": "R. Sennrich, B. Haddow and A. Birch", "year": "2016",
     "title": "Neural Machine Translation of Rare Words with Subword Units", "venue": "ACL 2016",
     "arxiv": "1508.07909"},
    {"key": "aoyama2025", "authors": "T. Aoyama, E. G. Wilcox and N. Schneider", "year": "2025",
     "title": "Predicting the Emergence of Induction Heads in Language Model Pretraining", "arxiv": "2511.16893"},
    {"key": "dao2022", "authors": "T. Dao et al.", "year": "2022",
     "title": "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
     "venue": "NeurIPS 2022", "arxiv": "2205.14135"},
    {"key": "dao2023", "authors": "T. Dao", "year": "2023",
     "title": "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
     "arxiv": "2307.08691"},
    {"key": "milakov2018", "authors": "M. Milakov and N. Gimelshein", "year": "2018",
     "title": "Online normalizer calculation for softmax", "arxiv": "1805.02867"},
    {"key": "rabe2021", "authors": "M. N. Rabe and C. Staats", "year": "2021",
     "title": "Self-attention Does Not Need O(n²) Memory", "arxiv": "2112.05682"},
    {"key": "shazeer2019", "authors": "N. Shazeer", "year": "2019",
     "title": "Fast Transformer Decoding: One Write-Head is All You Need", "arxiv": "1911.02150"},
    {"key": "ainslie2023", "authors": "J. Ainslie et al.", "year": "2023",
     "title": "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints",
     "venue": "EMNLP 2023", "arxiv": "2305.13245"},
    {"key": "beltagy2020", "authors": "I. Beltagy, M. E. Peters and A. Cohan", "year": "2020",
     "title": "Longformer: The Long-Document Transformer", "arxiv": "2004.05150"},
    {"key": "jiang2023", "authors": "A. Q. Jiang et al.", "year": "2023",
     "title": "Mistral 7B", "arxiv": "2310.06825"},
    {"key": "xiao2024", "authors": "G. Xiao et al.", "year": "2024",
     "title": "Efficient Streaming Language Models with Attention Sinks", "venue": "ICLR 2024",
     "arxiv": "2309.17453"},
    {"key": "miller2023", "authors": "E. Miller", "year": "2023", "title": "Attention Is Off By One",
     "venue": "blog post", "url": "https://www.evanmiller.org/attention-is-off-by-one.html"},
    {"key": "dehghani2023", "authors": "M. Dehghani et al.", "year": "2023",
     "title": "Scaling Vision Transformers to 22 Billion Parameters", "venue": "ICML 2023", "arxiv": "2302.05442"},
    {"key": "wortsman2023", "authors": "M. Wortsman et al.", "year": "2023",
     "title": "Small-scale proxies for large-scale Transformer training instabilities", "venue": "ICLR 2024",
     "arxiv": "2309.14322"},
    {"key": "deepseek2024", "authors": "DeepSeek-AI", "year": "2024",
     "title": "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model",
     "arxiv": "2405.04434"},
    {"key": "touvron2023", "authors": "H. Touvron et al.", "year": "2023",
     "title": "Llama 2: Open Foundation and Fine-Tuned Chat Models", "arxiv": "2307.09288"},
    {"key": "child2019", "authors": "R. Child et al.", "year": "2019",
     "title": "Generating Long Sequences with Sparse Transformers", "arxiv": "1904.10509"},
    {"key": "zaheer2020", "authors": "M. Zaheer et al.", "year": "2020",
     "title": "Big Bird: Transformers for Longer Sequences", "venue": "NeurIPS 2020", "arxiv": "2007.14062"},
]


def link(paper: dict[str, str]) -> str:
    """Where the paper can be read: its arXiv page, else its DOI, else its URL."""
    if paper.get("arxiv"):
        return f"https://arxiv.org/abs/{paper['arxiv']}"
    if paper.get("doi"):
        return f"https://doi.org/{paper['doi']}"
    return paper["url"]
