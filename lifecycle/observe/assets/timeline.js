(function(){
  var tip=document.getElementById('tip');
  document.querySelectorAll('#timeline-svg title').forEach(function(t){
    var p=t.parentNode; p.setAttribute('data-tip',t.textContent); p.removeChild(t);
  });
  document.getElementById('timeline-svg').addEventListener('mousemove',function(ev){
    var el=ev.target.closest('[data-tip]');
    if(!el){tip.style.display='none';return;}
    var lines=el.getAttribute('data-tip').split('\n');
    tip.textContent='';
    var b=document.createElement('b'); b.textContent=lines[0]; tip.appendChild(b);
    if(lines.length>1){tip.appendChild(document.createTextNode('\n'+lines.slice(1).join('\n')));}
    tip.style.display='block';
    var x=ev.clientX+14, y=ev.clientY+14;
    if(x+tip.offsetWidth>window.innerWidth){x=ev.clientX-tip.offsetWidth-10;}
    if(y+tip.offsetHeight>window.innerHeight){y=ev.clientY-tip.offsetHeight-10;}
    tip.style.left=x+'px'; tip.style.top=y+'px';
  });
  document.getElementById('timeline-svg').addEventListener('mouseleave',function(){tip.style.display='none';});
  document.body.setAttribute('data-ready','true');
})();
