"""What several stage kinds share and that is not a kind itself: the stage maker and the
builder of its tensors (`maker`, `builder`), a cell's arithmetic for `--why` (`cell`,
`product_cell`, `op_cell/`, `mask_why`, `mask_fill`), the quiz's questions and marking
(`quizzing`), a mask's shape in words (`mask_shape`), and what every kind's judge() reads
(`judging`: the Judge and its rows).

Never import torch, rich, textual or typer here, nor recognise, judge or anything above.
"""
